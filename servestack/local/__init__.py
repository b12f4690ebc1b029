"""`servestack local ...`: the serving topology on this machine, no Docker and no AWS."""
