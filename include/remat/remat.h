// remat/remat.h — everything: checkpointing (functions, modules, sequences) and memory accounting.
#pragma once

#include "remat/checkpoint.h"
#include "remat/checkpointed.h"
#include "remat/error.h"
#include "remat/memory.h"
#include "remat/memory_timeline.h"
#include "remat/ops/attention.h"
#include "remat/ops/dropout.h"
