#!/bin/sh
echo "coverage is unavailable in ptc's offline Bazel build" >&2
exit 1
