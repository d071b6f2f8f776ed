"""Tool calling: each family's call format (formats), the streamed parser of a reply into text and
calls (parser), the request's tools turned into the prompt and, when a call is required, into
a grammar (setup)."""
