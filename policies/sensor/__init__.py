"""Corral's built-in syscall sensor: bpftrace on sandbox cgroups -> ``Event``.

Import the pieces from their modules (``policies.sensor.sensor.Sensor``...);
this package stays import-light because ``policies.falco.fields`` uses
``policies.sensor.flags``.
"""
