"""What people read, rendered from the typed files alone (never recomputed): report.md, the
terminal table, the Serving section. Above the workloads (each renders its own engine section
and headlines), below the stages that write what it renders."""
