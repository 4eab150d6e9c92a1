#include "fault.h"
int fault_sc_linkdown(void) { return 77; }
