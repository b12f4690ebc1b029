"""The batch deployment's entries: the scheduled Lambda (`handler`), the manifest of a finished transform job
(`transform_done`), and the Fargate task (`python -m handlers.batch`)."""

import gc
import sys

if __name__ == "__main__":  # the Fargate task: its modules import with garbage collection off, as `main` expects
    gc.disable()  # (servestack/adapters/batch.py says why; `main` turns it back on)

from servestack.adapters.batch import handler, main, transform_done

__all__ = ["handler", "transform_done"]

if __name__ == "__main__":
    sys.exit(main())
