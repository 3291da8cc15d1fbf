#include <gtest/gtest.h>
#include "pallas/pallas.h"
