"""vLLM's `llm_request` spans over OTLP: gRPC and HTTP receivers, the decoder, and the forwarder that passes
every export on unchanged to the user's collector."""

from attrib_agent.sources.otlp.decode import DecodeResult, OtlpDecodeError, OtlpError, decode_export
from attrib_agent.sources.otlp.forward import OtlpForwarder
from attrib_agent.sources.otlp.grpc_receiver import OtlpGrpcReceiver
from attrib_agent.sources.otlp.http_receiver import otlp_http_app
from attrib_agent.sources.otlp.source import SPEC, OtlpSource

__all__ = ["SPEC", "DecodeResult", "OtlpDecodeError", "OtlpError", "OtlpForwarder", "OtlpGrpcReceiver",
           "OtlpSource", "decode_export", "otlp_http_app"]
