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
//   planning    planning/budget.h, cost_model.h (the table, the simulator), planner.h (the dynamic
//               program, Revolve, Chen), shape_costs.h (tables fitted across input shapes),
//               throughput.h: pure algorithms on cost tables, nothing run
//   measure     measure/profiler.h (a chain's cost table), batch_profiles.h, plan_measurement.h
//               (plans run for real: time, bytes, exactness), plan_comparison.h
//   autoplan    autoplan/make_plan.h (the one front door: profile, solve, verify, measured
//               choice), autoplan/planned.h (a Sequential that plans itself)
//   graph       graph/planned_step.h (any model's step recorded, planned over its graph, replayed op by op)
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
#include "remat/planning/budget.h"
#include "remat/planning/cost_model.h"
#include "remat/planning/planner.h"
#include "remat/planning/shape_costs.h"
#include "remat/planning/throughput.h"
#include "remat/measure/batch_profiles.h"
#include "remat/measure/plan_comparison.h"
#include "remat/measure/plan_measurement.h"
#include "remat/measure/profiler.h"
#include "remat/autoplan/make_plan.h"
#include "remat/autoplan/planned.h"
#include "remat/graph/planned_step.h"
#include "remat/distributed/data_parallel.h"
