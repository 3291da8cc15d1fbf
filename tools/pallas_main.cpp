#include <cstdio>
int main() { std::puts("pallas: placeholder"); return 0; }
