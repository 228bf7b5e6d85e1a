"""The access report: what a run read from where, built from the nodes' statistics.

Rooms: ``build`` (the JSON document, combined over nodes), ``store`` (written and read back),
``text`` (the printed table), ``html`` (one self-contained page with plots), ``timeline``
(the daemon's sampled time series, and nodes' series on one grid), ``sharing`` (what a job
says of the copies it shares with the user's other jobs, at its start and in the text).
"""
