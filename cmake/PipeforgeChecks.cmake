# Build-time checks on the target graph.

# pipeforge_link_closure(TARGET OUT): TARGET and every target or library it
# links, directly or through its dependencies' link libraries.
function(pipeforge_link_closure target out)
  set(seen "")
  set(queue ${target})
  while(queue)
    list(POP_FRONT queue current)
    if(current IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${current})
    if(TARGET ${current})
      get_target_property(libs ${current} LINK_LIBRARIES)
      get_target_property(ilibs ${current} INTERFACE_LINK_LIBRARIES)
      foreach(lib IN LISTS libs ilibs)
        if(lib AND NOT lib MATCHES "NOTFOUND$" AND NOT lib MATCHES "^\\$<")
          list(APPEND queue ${lib})
        endif()
      endforeach()
    endif()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

# pipeforge_assert_not_linked(TARGET FORBIDDEN)
# Fails configuration when FORBIDDEN appears anywhere in TARGET's transitive
# link libraries. Used to keep schedules/ free of LibTorch (Note [Torch-free schedules]).
function(pipeforge_assert_not_linked target forbidden)
  pipeforge_link_closure(${target} closure)
  foreach(current IN LISTS closure)
    if(current MATCHES "${forbidden}")
      message(FATAL_ERROR "${target} links ${current} (through its link libraries); "
                          "${target} must not depend on ${forbidden}. Remove that dependency.")
    endif()
  endforeach()
endfunction()
