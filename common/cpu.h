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

}  // namespace ptc

#endif  // PTC_COMMON_CPU_H_
