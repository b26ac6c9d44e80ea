// remat/remat.h — the whole public API in one include.
//
//   checkpointing     checkpoint.h (functions), checkpointed.h (modules, Sequential segments),
//                     selective.h (a policy per operator call: keep matmuls, recompute the rest)
//   planning          chain.h, sequential_chain.h (your model as a chain), plan.h, policies.h,
//                     budget.h, cost_model.h, profiler.h, planner.h, budget_planner.h, planned.h,
//                     plan_request.h (a policy, a plan file or a budget: one decision),
//                     plan_measurement.h, plan_comparison.h (measured: the planner against policies),
//                     threads.h (the CPU threads it times under)
//   accounting        memory.h, memory_timeline.h
//   inside operations ops/attention.h, ops/dropout.h
//   data parallel     distributed.h
//   errors            error.h
//
// Each header also stands alone (a test includes each by itself), for builds that want less.
#pragma once

#include "remat/budget.h"
#include "remat/budget_planner.h"
#include "remat/chain.h"
#include "remat/checkpoint.h"
#include "remat/checkpointed.h"
#include "remat/cost_model.h"
#include "remat/distributed.h"
#include "remat/error.h"
#include "remat/memory.h"
#include "remat/memory_timeline.h"
#include "remat/ops/attention.h"
#include "remat/ops/dropout.h"
#include "remat/plan.h"
#include "remat/plan_comparison.h"
#include "remat/plan_measurement.h"
#include "remat/plan_request.h"
#include "remat/planned.h"
#include "remat/planner.h"
#include "remat/policies.h"
#include "remat/profiler.h"
#include "remat/selective.h"
#include "remat/sequential_chain.h"
#include "remat/threads.h"
#include "remat/throughput.h"
