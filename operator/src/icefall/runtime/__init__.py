"""What every Icefall process carries beside its work: the one Prometheus registry it serves (`metrics`)
and the named failpoints a test can arm in it (`failpoints`).

Both are leaves: they import nothing of Icefall but `plan` (metrics reads a lease threshold from it), so
any layer may use them. Nothing is imported here.
"""
