# shellcheck shell=bash
# Sourced by run_pretraining.sh, run_squad.sh and run_glue.sh: NVIDIA's positional `precision` argument.

# add_precision_flag PRECISION: appends the flag of fp16 | bf16 | tf32 | fp32 (none) to the caller's `flags`
# array; any other value ends the script with exit status 2.
add_precision_flag() {
  case "$1" in
    fp16) flags+=(--fp16) ;;
    bf16) flags+=(--bf16) ;;
    tf32) flags+=(--tf32) ;;
    fp32) ;;
    *) echo "error: unknown precision '$1' (fp16, bf16, tf32 or fp32)" >&2; exit 2 ;;
  esac
}
