"""Replicas of the engine behind one endpoint, on Ray Serve (`hybrid cluster`; the optional
`cluster` extra). deployment.py has the shape; nothing here is imported by `hybrid serve`."""
