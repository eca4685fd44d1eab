"""What the controller and the workers share (pure, no I/O): ``ops`` (what an op of the stream
is), ``shapes`` (shape propagation on meta tensors, signatures) and ``errors``."""
