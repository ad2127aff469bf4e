// What the CPU this process runs on can do, for code with a faster path
// (checked once, at first use).
#ifndef PTC_COMMON_CPU_H_
#define PTC_COMMON_CPU_H_

namespace ptc {

// AVX2 (every x86-64 server of the last decade; not ARM).
inline bool CpuHasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}

// AVX-512 with 64-bit lane multiplies (AVX-512F and DQ: Intel server CPUs
// since Skylake-SP, AMD since Zen 4), usable by this process (the kernel
// saves the 512-bit registers: checked through XCR0 by the compiler's
// runtime).
inline bool CpuHasAvx512Dq() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0 &&
           __builtin_cpu_supports("avx512dq") != 0;
  }();
  return has;
}

}  // namespace ptc

#endif  // PTC_COMMON_CPU_H_
