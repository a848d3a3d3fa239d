#include <stddef.h>
#include <stdint.h>

// libFuzzer's driver (compiler-rt, linked by -sanitize=fuzzer): what its own main() calls.
// SwiftPM links every executable with `--defsym main=<module>_main`, so libFuzzer's main()
// never runs; each target's main.swift calls this instead.
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));
