"""Prefork supervision: the arbiter that forks and watches children, the
child's life, the shared slots through which children show they are alive."""
