"""Generated gRPC code for protobuf package percolake.v1: run scripts/gen_protos.py."""
