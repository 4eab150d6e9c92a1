/* Negative control for check_exports.sh: exports one table plus a symbol that must be
 * flagged, so a checker that passes everything fails its test. */
__attribute__((visibility("default"))) const int ncclNetPlugin_v12 = 12;
__attribute__((visibility("default"))) int agoq_exports_leak(void) { return 0; }
