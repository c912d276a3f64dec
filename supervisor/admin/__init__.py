"""The operator's commands as plain data, shared by the command line and the
dashboard: status, failed, retry, cancel, pause and resume
(:mod:`.commands`), and the schedules of periodic jobs (:mod:`.periodic`)."""
