"""What the controller and the workers share (pure, no I/O): ``ops`` (what an op of the stream
is), ``kinds`` (the table of op kinds: payload fields, who records, who runs each), ``shapes``
(shape propagation on meta tensors, signatures) and ``errors``."""
