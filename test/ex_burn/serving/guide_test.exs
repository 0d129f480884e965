defmodule ExBurn.Serving.GuideTest do
  use ExUnit.Case, async: true
  use ExBurn.DocExamples, file: "guides/serving.md"
end
