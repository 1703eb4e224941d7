# shellcheck shell=bash
# Sourced by run_pretraining.sh, run_squad.sh and run_glue.sh: NVIDIA's positional `precision` argument and the
# checks of the other positional arguments that only the scripts read. A refused argument is one line on stderr,
# `error: <argument>: <problem>`, and exit status 2, before anything is created (as the entry points do).

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

# refuse_argument NAME POSITION VALUE PROBLEM: ends the script with the one-line error and exit status 2.
refuse_argument() {
  echo "error: $1 (argument $2): '$3' $4" >&2
  exit 2
}

# require_boolean NAME POSITION VALUE: true or false (a typo such as "ture" would otherwise mean false).
require_boolean() {
  case "$3" in
    true|false) ;;
    *) refuse_argument "$1" "$2" "$3" "is neither true nor false" ;;
  esac
}

# require_count NAME POSITION VALUE: a whole number of at least 1 (a number of processes).
require_count() {
  [[ $3 =~ ^[1-9][0-9]*$ ]] || refuse_argument "$1" "$2" "$3" "is not a whole number of at least 1"
}

# require_mode POSITION MODE: the words train, eval and prediction, joined by spaces, "+", "," or "_" (a typo such
# as "trian eval" would otherwise skip training without a word).
require_mode() {
  local words word
  read -ra words <<< "${2//[,+_]/ }"
  [ "${#words[@]}" -gt 0 ] || refuse_argument mode "$1" "$2" "names nothing to do (train, eval and/or prediction)"
  for word in "${words[@]}"; do
    case "$word" in
      train|eval|prediction) ;;
      *) refuse_argument mode "$1" "$2" "is not train, eval, prediction or a combination such as 'train eval'" ;;
    esac
  done
}
