"""The operator's read-only web pages (`tuneharness web`) and the same pages as one HTML file
(`tuneharness report --html FILE`): fleet, money, reliability and each job.

`data` reads (through the existing readers: status, receipts, timeline, ledger), `svg` draws,
`pages` renders escaped HTML, `server` answers GET on a ThreadingHTTPServer. Every script and
style ships in `static/`; nothing is fetched from another origin.
"""
