"""ptc_proto_library: C++ and gRPC code from a .proto with the system protoc.

Bazel 4 offline has no usable proto_library for C++ here, so one genrule runs
Debian's `protoc` and `grpc_cpp_plugin` and a cc_library wraps the output.
Each file x.proto yields three names:
  x_proto     the generated sources (filegroup)
  x_cc_proto  messages only
  x_cc_grpc   messages and gRPC services
"""

def ptc_proto_library(name, src, deps = [], grpc = False):
    """Generates C++ (and optionally gRPC) code for `src`.

    Args:
      name: base name, e.g. "plan" for plan.proto.
      src: the .proto file, in this package.
      deps: other base names in this package whose .proto this one imports.
      grpc: whether the file defines services.
    """
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    dep_srcs = [d + ".proto" for d in deps]
    cmd = "protoc --proto_path=. --cpp_out=$(GENDIR) "
    if grpc:
        cmd += ("--grpc_out=$(GENDIR) " +
                "--plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin) ")
    cmd += "$(location " + src + ")"
    native.genrule(
        name = name + "_proto",
        srcs = [src] + dep_srcs,
        outs = outs,
        cmd = cmd,
        message = "protoc " + src,
    )
    native.cc_library(
        name = name + "_cc_proto",
        srcs = [base + ".pb.cc"],
        hdrs = [base + ".pb.h"],
        deps = [d + "_cc_proto" for d in deps] + ["//third_party:protobuf"],
        visibility = ["//visibility:public"],
    )
    if grpc:
        native.cc_library(
            name = name + "_cc_grpc",
            srcs = [base + ".grpc.pb.cc"],
            hdrs = [base + ".grpc.pb.h"],
            deps = [name + "_cc_proto", "//third_party:grpc"],
            visibility = ["//visibility:public"],
        )
