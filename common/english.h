// Counting words in messages, written once: "1 stage", "2 stages";
// "a, b or c".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipeforge {

// `n` and the noun, with an "s" unless n is 1: counted(2, "rank") is
// "2 ranks". For nouns whose plural adds an "s" only.
std::string counted(std::int64_t n, const std::string& noun);

// The items as a list of choices: "a", "a or b", "a, b or c".
std::string joinChoices(const std::vector<std::string>& items);

}  // namespace pipeforge
