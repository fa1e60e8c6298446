// Names the PT2 importer makes: identifiers, class names and module paths.
#include "frontend/pt2_names.h"

#include <gtest/gtest.h>

namespace pipeforge::frontend {
namespace {

using Strings = std::vector<std::string>;

TEST(Pt2Names, IdentifiersFromExportValueNames) {
  EXPECT_EQ(pt2Identifier("getitem.1"), "getitem_1");
  EXPECT_EQ(pt2Identifier("p_blocks_0_fc_weight"), "p_blocks_0_fc_weight");
  EXPECT_EQ(pt2Identifier("0"), "v_0");
  EXPECT_EQ(pt2Identifier(""), "v_");
}

TEST(Pt2Names, ClassNamesFromPythonTypes) {
  EXPECT_EQ(pt2ClassName("generate_zoo.Block"), "__torch__.pipeforge_pt2.generate_zoo.Block");
  EXPECT_EQ(pt2ClassName("m.Gen[int, str]"), "__torch__.pipeforge_pt2.m.Gen_int__str_");
  EXPECT_EQ(pt2ClassName(""), "__torch__.pipeforge_pt2.ClassNotRecorded");
}

TEST(Pt2Names, PathsTakenApart) {
  EXPECT_EQ(pathParts("blocks.0.attn"), (Strings{"blocks", "0", "attn"}));
  EXPECT_EQ(pathParts("fc"), Strings{"fc"});
  EXPECT_TRUE(pathParts("").empty());
  EXPECT_EQ(relativePath("blocks.0.attn", "blocks"), "0.attn");
  EXPECT_EQ(relativePath("blocks.0", ""), "blocks.0");
  EXPECT_EQ(relativePath("blocks.0", "blocks.0"), "");
}

}  // namespace
}  // namespace pipeforge::frontend
