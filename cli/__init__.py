"""The `hybrid` command line: above the server (server/) and the runtime (hybrid/), which import
nothing from here."""
