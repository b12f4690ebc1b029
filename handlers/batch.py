"""The batch deployment's entries: the scheduled Lambda (`handler`), the manifest of a finished transform job
(`transform_done`), and the Fargate task (`python -m handlers.batch`)."""

import sys

from servestack.adapters.batch import handler, main, transform_done

__all__ = ["handler", "transform_done"]

if __name__ == "__main__":
    sys.exit(main())
