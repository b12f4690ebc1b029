"""CodeBuild, as `local up` plays it: the delivery pipeline's smoke-test steps run against the running emulator.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

__all__ = []
