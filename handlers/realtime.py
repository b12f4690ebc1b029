"""The realtime container's entry (`python -m handlers.realtime serve`, what SageMaker's `serve` runs)."""

from servestack.adapters.realtime import main

if __name__ == "__main__":
    main()
