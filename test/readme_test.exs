defmodule ExBurn.ReadmeTest do
  use ExUnit.Case, async: true
  use ExBurn.DocExamples, file: "README.md"
end
