"""The six use cases, each a function of the kernel, the call and its validated arguments."""
