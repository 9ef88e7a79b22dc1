"""OTLP receivers: gRPC and HTTP (protobuf and JSON), with bearer auth and TLS."""
