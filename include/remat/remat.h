// remat/remat.h — the whole public API in one include.
//
//   base        base/error.h (how misuse is reported), base/threads.h (the CPU threads timed under)
//   memory      memory/memory.h (exact bytes held), memory/memory_timeline.h
//   checkpoint  checkpoint/checkpoint.h (functions), checkpoint/checkpointed.h (modules, Sequential
//               segments), checkpoint/selective.h (a policy per operator call),
//               checkpoint/saved_tensors.h (what a forward saves, for cost models)
//   ops         ops/attention.h, ops/dropout.h (recomputation inside operations)
//   chain       chain/chain.h, chain/sequential_chain.h (your model as a chain), chain/plan.h,
//               chain/policies.h (the rules of thumb), chain/chain_state.h (kept across a measurement)
//   measure     measure/plan_measurement.h (plans run for real: time, bytes, exactness)
//   planning    planning/budget.h, cost_model.h, profiler.h, planner.h, budget_planner.h,
//               planned.h, plan_request.h, throughput.h, plan_comparison.h
//   distributed distributed/data_parallel.h
//
// Each room includes only the rooms above it in this list (tests/layering_test.sh); each header
// also stands alone (a test includes each by itself), for builds that want less.
#pragma once

#include "remat/base/error.h"
#include "remat/base/threads.h"
#include "remat/memory/memory.h"
#include "remat/memory/memory_timeline.h"
#include "remat/checkpoint/checkpoint.h"
#include "remat/checkpoint/checkpointed.h"
#include "remat/checkpoint/saved_tensors.h"
#include "remat/checkpoint/selective.h"
#include "remat/ops/attention.h"
#include "remat/ops/dropout.h"
#include "remat/chain/chain.h"
#include "remat/chain/chain_state.h"
#include "remat/chain/plan.h"
#include "remat/chain/policies.h"
#include "remat/chain/sequential_chain.h"
#include "remat/measure/plan_measurement.h"
#include "remat/planning/budget.h"
#include "remat/planning/budget_planner.h"
#include "remat/planning/cost_model.h"
#include "remat/planning/plan_comparison.h"
#include "remat/planning/plan_request.h"
#include "remat/planning/planned.h"
#include "remat/planning/planner.h"
#include "remat/planning/profiler.h"
#include "remat/planning/throughput.h"
#include "remat/distributed/data_parallel.h"
