// The main() of every Catch2 unit test binary in ptc.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
