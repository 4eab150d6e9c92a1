#include "fault.h"
int fault_sc_flood(int n) { (void)n; return 77; }
