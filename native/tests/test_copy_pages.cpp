#include "check.h"
int main() { return check_exit_code("test_copy_pages"); }
