"""`servestack monitor`: captured traffic against a baseline, column by column and in the predictions.

records.py reads the capture records and decodes them with the model's own decoder; baseline.py reads the
baseline rows the same way; table.py gathers both into columns; statistics.py holds the statistics and
drift.py the verdict per column; compare.py runs the whole comparison and report.py writes the HTML report.
The command itself is servestack/cli/monitor.py.
"""
