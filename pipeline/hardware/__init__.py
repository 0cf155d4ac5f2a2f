"""The hardware feature database: what a device can do, as figures a performance model uses.

entry.py holds the typed records (HardwareEntry: memory bandwidth per level, peak arithmetic
per data type with the instruction set behind it, cores and threads); probe_memory.py and
probe_compute.py measure this machine; caches.py reads its cache sizes; specified.py holds
makers' published figures for devices we cannot measure; database.py caches this machine's
measured entry per device identity and looks entries up by name.
"""
