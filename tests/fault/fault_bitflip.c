#include "fault.h"
int fault_sc_bitflip(int s, uint64_t x) { (void)s; (void)x; return 77; }
