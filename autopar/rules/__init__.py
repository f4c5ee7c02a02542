"""One small rule per op kind: each turns a traced call into an ir.Node with its iteration space."""
