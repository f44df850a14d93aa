"""Generated gRPC code for package percolake.v1: run scripts/gen_protos.py."""
