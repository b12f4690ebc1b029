"""CloudWatch Logs, as `local up` plays it: one log file per child, and each child's lines shipped to the
emulator's log groups.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.logs.log_files import LineLog, check_deployment, child_log, parse_since, show, start_fresh
    from servestack.local.logs.shipping import LOGS_TYPES, LogShipper, ensure_log_group, lambda_stream_name
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = [
    "LOGS_TYPES",
    "LineLog",
    "LogShipper",
    "check_deployment",
    "child_log",
    "ensure_log_group",
    "lambda_stream_name",
    "parse_since",
    "show",
    "start_fresh",
]
