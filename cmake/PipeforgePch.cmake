# Note [Precompiled LibTorch headers]: parsing LibTorch's headers costs 6-10 s
# of every translation unit that includes them, and most of our library, test
# and bench sources do. One target, pipeforge_torch_pch, compiles them once
# into a precompiled header; every other static library and executable that
# links torch reuses it (REUSE_FROM), so torch is parsed once per build rather
# than once per file.
#
# Why it stays correct:
#   - GCC checks a .gch against the compile flags and macros it was made with;
#     a target whose flags differ in a way that matters gets "-Winvalid-pch"
#     and parses the headers as text, which is slower but the same program.
#   - The header only adds includes a file may not have asked for; it never
#     changes what a file's own includes mean. Every source still includes what
#     it uses, so each compiles on its own with PCH off (-DPIPEFORGE_PCH=OFF).
#   - Shared and module libraries (-fPIC) are left out: GCC refuses a .gch made
#     without -fPIC there.
#   - ccache caches compiles that use a .gch only when told to be sloppy about
#     __DATE__/__TIME__ and the .gch's macro list; the launcher sets that.
option(PIPEFORGE_PCH "Precompile LibTorch's headers once and reuse them in every torch target" ON)

# Note [Unity batches]: the precompiled header saves only the parse, about a
# fifth of a torch file's 25-35 s. Most of the rest is instantiating and
# optimizing the same inline functions and templates (LibTorch's, and fmt's and
# nlohmann::json's header-only code, which costs torch-free files 10-30 s too)
# in every file. Compiled together in batches, each batch does that once:
# measured on 4 of our torch files, 94 s apart against 51 s as one unit. So the
# sources of every target compile in unity batches of up to
# PIPEFORGE_UNITY_BATCH files (0 or 1: one file per unit, as a developer may
# prefer for fast rebuilds of one file).
#
# Why it stays correct:
#   - The batches are only a grouping of the build; every file still includes
#     what it uses and compiles on its own with PIPEFORGE_UNITY_BATCH=0.
#   - A name that two files of one target both define at file scope, in an
#     anonymous namespace too, is a compile error in a batch, never a silent
#     mix-up: such helpers get names of their own. A file-scope `using` that
#     would make a name ambiguous in the next file is written as an alias with
#     its own name for the same reason.
#   - g++'s -Wsubobject-linkage exempts only the main file's classes from its
#     check of fields whose type is file-local. In a batch every source is an
#     included file, so a pimpl holding a file-local helper (as Impl classes
#     do) would warn although each file alone is clean; batched targets turn
#     that one warning off.
set(PIPEFORGE_UNITY_BATCH 8 CACHE STRING
    "Compile each target's sources in unity batches of this many files (0: one file per unit)")

set(PIPEFORGE_TORCH_PCH_HEADERS
  <torch/script.h>
  <ATen/ATen.h>
  <torch/csrc/jit/ir/ir.h>)

# pipeforge_torch_pch_setup(): the target that owns the precompiled header.
function(pipeforge_torch_pch_setup)
  if(NOT PIPEFORGE_PCH)
    return()
  endif()
  set(src "${CMAKE_BINARY_DIR}/pipeforge_torch_pch.cpp")
  if(NOT EXISTS "${src}")
    file(WRITE "${src}" "// Compiles the precompiled LibTorch header (Note [Precompiled LibTorch headers]).\n")
  endif()
  add_library(pipeforge_torch_pch STATIC "${src}")
  # The flags most torch targets have (compat brings FMT_HEADER_ONLY), so the
  # .gch is valid for them.
  target_link_libraries(pipeforge_torch_pch PRIVATE torch pipeforge_torch_compat fmt::fmt nlohmann_json::nlohmann_json)
  target_precompile_headers(pipeforge_torch_pch PRIVATE ${PIPEFORGE_TORCH_PCH_HEADERS})
endfunction()

# Every target defined in `dir` and below it.
function(_pipeforge_targets_below dir out)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _pipeforge_targets_below("${sub}" more)
    list(APPEND targets ${more})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# Whether `file` includes a LibTorch header, itself or through the project's
# own headers (quoted includes, found beside the file or under the root).
# Results are cached per file for the whole configure run.
function(_pipeforge_includes_torch file out)
  get_property(known GLOBAL PROPERTY "_pf_torch_inc:${file}" SET)
  if(known)
    get_property(result GLOBAL PROPERTY "_pf_torch_inc:${file}")
    set(${out} ${result} PARENT_SCOPE)
    return()
  endif()
  # Assume no while recursing, so an include loop ends.
  set_property(GLOBAL PROPERTY "_pf_torch_inc:${file}" FALSE)
  set(result FALSE)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include")
  get_filename_component(dir "${file}" DIRECTORY)
  foreach(line IN LISTS lines)
    if(line MATCHES "<(torch|ATen|c10|caffe2)/")
      set(result TRUE)
      break()
    endif()
    if(line MATCHES "\"([^\"]+)\"")
      set(inc "${CMAKE_MATCH_1}")
      foreach(base "${dir}" "${PROJECT_SOURCE_DIR}")
        if(EXISTS "${base}/${inc}")
          _pipeforge_includes_torch("${base}/${inc}" sub)
          if(sub)
            set(result TRUE)
          endif()
          break()
        endif()
      endforeach()
      if(result)
        break()
      endif()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY "_pf_torch_inc:${file}" ${result})
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# The C++ sources `paths` of `target` in unity batches of at most
# PIPEFORGE_UNITY_BATCH files, as even as the count allows, in listing order.
# Sets `out` to whether it batched them.
function(_pipeforge_unity_batches target paths out)
  set(${out} FALSE PARENT_SCOPE)
  list(LENGTH paths n)
  if(PIPEFORGE_UNITY_BATCH LESS 2 OR n LESS 2)
    return()
  endif()
  math(EXPR batches "(${n} + ${PIPEFORGE_UNITY_BATCH} - 1) / ${PIPEFORGE_UNITY_BATCH}")
  set(i 0)
  foreach(path IN LISTS paths)
    math(EXPR batch "${i} * ${batches} / ${n}")
    set_source_files_properties("${path}" TARGET_DIRECTORY ${target} PROPERTIES UNITY_GROUP "batch${batch}")
    math(EXPR i "${i} + 1")
  endforeach()
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE GROUP)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-subobject-linkage)
  endif()
  set(${out} TRUE PARENT_SCOPE)
endfunction()

# pipeforge_build_units_apply(): after every target is defined, decides how
# each static library's and executable's sources compile.
#   - Every target's sources go in unity batches (Note [Unity batches]).
#   - A target that links torch reuses the precompiled header
#     (Note [Precompiled LibTorch headers]) when any of its sources includes
#     LibTorch: in all its batches, or, unbatched, in the files that include
#     LibTorch. An unbatched torch-free file skips it: loading the 0.5 GB header
#     costs such a file more (about 6 s) than it compiles in; a batch pays it
#     once. Position-independent targets never reuse it (see the Note).
function(pipeforge_build_units_apply)
  _pipeforge_targets_below("${PROJECT_SOURCE_DIR}" targets)
  set(pch_targets 0)
  set(batched_targets 0)
  foreach(t IN LISTS targets)
    if(t STREQUAL "pipeforge_torch_pch")
      continue()
    endif()
    get_target_property(type ${t} TYPE)
    if(NOT type STREQUAL "STATIC_LIBRARY" AND NOT type STREQUAL "EXECUTABLE")
      continue()
    endif()
    get_target_property(sources ${t} SOURCES)
    get_target_property(source_dir ${t} SOURCE_DIR)
    set(paths "")
    set(torch_free "")
    set(torch_sources 0)
    foreach(src IN LISTS sources)
      if(NOT src MATCHES "\\.(cpp|cc|cxx)$")
        continue()
      endif()
      if(IS_ABSOLUTE "${src}")
        set(path "${src}")
      else()
        set(path "${source_dir}/${src}")
      endif()
      list(APPEND paths "${path}")
      set(uses FALSE)
      if(EXISTS "${path}")
        _pipeforge_includes_torch("${path}" uses)
      endif()
      if(uses)
        math(EXPR torch_sources "${torch_sources} + 1")
      else()
        list(APPEND torch_free "${path}")
      endif()
    endforeach()
    _pipeforge_unity_batches(${t} "${paths}" batched)
    if(batched)
      math(EXPR batched_targets "${batched_targets} + 1")
    endif()

    if(NOT PIPEFORGE_PCH OR NOT TARGET pipeforge_torch_pch OR torch_sources EQUAL 0)
      continue()
    endif()
    get_target_property(pic ${t} POSITION_INDEPENDENT_CODE)
    if(pic)
      continue()
    endif()
    pipeforge_link_closure(${t} closure)
    if(NOT "torch" IN_LIST closure)
      continue()
    endif()
    target_precompile_headers(${t} REUSE_FROM pipeforge_torch_pch)
    math(EXPR pch_targets "${pch_targets} + 1")
    if(NOT batched)
      foreach(path IN LISTS torch_free)
        set_source_files_properties("${path}" TARGET_DIRECTORY ${t} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
      endforeach()
    endif()
  endforeach()
  message(STATUS "Pipeforge: ${batched_targets} targets compile in unity batches of up to ${PIPEFORGE_UNITY_BATCH} files; "
                 "${pch_targets} reuse the precompiled LibTorch header")
endfunction()
