// What compute commands (train, shardings, peak) say about the machine: the
// CPU, the ISA level the kernels run at and the matmul route, on their first
// line and in their --json; the one-line notes for requests this CPU cannot
// do fast; and the check of MULTISLICE_MAX_ISA every command makes first.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace multislice::cli {

// "CPU Intel(R) Xeon(R) Processor, ISA avx2 (capped from amx), matmul
// bfloat16 via float32 kernels (avx2)".
std::string PlatformText(DType matmul_type);

// {"cpu", "isa", "detected_isa", "matmul", "onednn_isa"} for --json.
nlohmann::json PlatformJson(DType matmul_type);

// One line each, without a trailing newline: a dtype of bfloat16 asked for
// explicitly (`dtype_explicit`) on a CPU without bf16 matmul instructions,
// and a MULTISLICE_MAX_ISA below (or above) what the CPU has.
std::vector<std::string> PlatformNotes(DType matmul_type, bool dtype_explicit);

// MULTISLICE_MAX_ISA is unset or a level; kInvalidArgument naming it.
Status CheckIsaCap();

}  // namespace multislice::cli
