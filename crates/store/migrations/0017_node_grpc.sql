-- The gRPC address the other nodes forward gRPC calls to (`http://host:port`); NULL for a
-- node that serves no gRPC.
ALTER TABLE nodes ADD COLUMN grpc_address TEXT;
