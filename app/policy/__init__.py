"""The policy layer: pure decisions from observations.

Standard library and `app.market` domain types only. No I/O, no clock reads: every function
takes `now` (seconds) from its caller, and returns decisions (frozen dataclasses) that a driver
applies: Celery in real time, the campaign simulator in virtual time.
"""
