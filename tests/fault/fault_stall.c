#include "fault.h"
int fault_sc_stall(void) { return 77; }
