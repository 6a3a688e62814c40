// check.h: a minimal assertion kit for the native tests.
//
// CHECK records a failure and continues; REQUIRE stops the test at once. A
// test's main returns check_exit_code(), non-zero when any check failed.
#ifndef LOCKSTEP_NATIVE_TESTS_CHECK_H
#define LOCKSTEP_NATIVE_TESTS_CHECK_H

#include <cstdio>
#include <cstdlib>

inline int& check_failures() {
  static int failures = 0;
  return failures;
}

#define CHECK(cond)                                                             \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++check_failures();                                                       \
    }                                                                           \
  } while (0)

// CHECK with a printf-style explanation.
#define CHECKF(cond, ...)                                                       \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                        \
      std::fprintf(stderr, "\n");                                               \
      ++check_failures();                                                       \
    }                                                                           \
  } while (0)

#define REQUIRE(cond)                                                           \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

inline int check_exit_code(const char* test) {
  if (check_failures() == 0) {
    std::printf("%s: PASS\n", test);
    return 0;
  }
  std::printf("%s: FAIL (%d checks)\n", test, check_failures());
  return 1;
}

#endif  // LOCKSTEP_NATIVE_TESTS_CHECK_H
