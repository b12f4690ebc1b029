"""Kinesis Data Firehose fed by CloudWatch Logs subscription filters, as `local up` plays it: the lines a log
group accepted that the filter's pattern selects, written to the stream's S3 destination with its role.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.firehose.delivery import FIREHOSE_TYPES, DeliveryDef, FirehosePlayer, read_deliveries
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = ["FIREHOSE_TYPES", "DeliveryDef", "FirehosePlayer", "read_deliveries"]
