# shellcheck shell=bash
# Sourced by .ci/run and scripts/stress-tests.sh: the environment the test command runs
# under in CI, so that a run by hand requires what CI requires.
#
# Backends that must have devices here: a run that quietly skipped them would test
# nothing. Vulkan runs on lavapipe with the validation layer, and any message it reports
# fails the run.
export XPU_REQUIRE="${XPU_REQUIRE:-host,vulkan,plugin.simnpu,plugin.minimal}"
# The tests across processes need mpirun (Open MPI, from scripts/deps.sh).
export XPU_REQUIRE_MPI="${XPU_REQUIRE_MPI:-1}"
export XPU_VULKAN_VALIDATION="${XPU_VULKAN_VALIDATION:-1}"
lavapipe="/usr/share/vulkan/icd.d/lvp_icd.$(uname -m).json"
if [[ -z "${VK_DRIVER_FILES:-}" && -f "$lavapipe" ]]; then
  # Load only lavapipe: faster start-up, and no attempt to probe absent GPU drivers.
  export VK_DRIVER_FILES="$lavapipe"
fi
unset lavapipe
