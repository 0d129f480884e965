defmodule ExBurn.Scripts.TestAllTest do
  # mix test.all: the stage selection and the counts it reads off each stage's output.
  use ExUnit.Case, async: true

  alias Mix.Tasks.Test.All

  test "stages run in their fixed order; --only and --skip select, unknown names raise" do
    assert All.selected([]) == [:rust, :rust_avx2, :exunit, :nx_suite, :nx_suite_compiler, :axon_suite]
    assert All.selected(skip: "rust") == [:rust_avx2, :exunit, :nx_suite, :nx_suite_compiler, :axon_suite]
    assert All.selected(only: "axon_suite,rust") == [:rust, :axon_suite]
    assert All.selected(only: "rust,exunit", skip: "rust") == [:exunit]
    assert_raise Mix.Error, ~r/unknown stage "nx"/, fn -> All.selected(only: "nx") end
  end

  test "cargo's results are summed over its test binaries" do
    output = """
    test result: ok. 190 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 80.1s
    test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s
    """

    assert All.counts(:rust, output, 101) == "193 passed, 2 failed, 1 ignored"
    assert All.counts(:rust, "error: could not compile", 101) == "no test results (exit 101)"
  end

  test "ExUnit's last summary line, in the forms of Elixir 1.14 and 1.18" do
    out = All.counts(:exunit, "4 doctests, 537 tests, 0 failures, 12 excluded, 5 skipped\n", 0)
    assert out =~ ~r/^with(out)? Nx: 4 doctests, 537 tests, 0 failures, 12 excluded, 5 skipped$/
    assert All.counts(:exunit, "Finished\n3 tests, 1 failure\n", 2) =~ ~r/Nx: 3 tests, 1 failure$/
    assert All.counts(:exunit, "** (CompileError) boom", 1) =~ ~r/Nx: no ExUnit result \(exit 1\)$/
  end

  test "a suite's verdict line, and whether its failures were all explained" do
    output = """
    1380 doctests, 1322 tests, 44 failures, 4 excluded

    Nx's own tests through ExBurn (backend): 2698 run, 2654 pass, 44 fail
      44 equal_values: ...
    """

    assert All.counts(:nx_suite, output, 0) == "2698 run, 2654 pass, 44 fail, every failure explained"

    assert All.counts(:axon_suite, output, 1) ==
             "2698 run, 2654 pass, 44 fail, unexplained failures or a crash"

    assert All.counts(:nx_suite, "** (RuntimeError) Nx is not loaded", 1) == "no suite result (exit 1)"
  end

  test "the failing tests a stage printed, named with where and why" do
    exunit = """
    ....

      1) test a served request streams (ExBurn.ServerTest)
         test/ex_burn/server/server_test.exs:120
         Assertion failed, no matching message after 100ms
         code: assert_receive {:done, _}

    .....
      2) test another (ExBurn.OtherTest)
         test/other_test.exs:7
         ** (ExBurn.Error) load_model: not found

    Finished in 1.0 seconds
    3 tests, 2 failures
    """

    assert All.failures(:exunit, exunit) == [
             "test a served request streams (ExBurn.ServerTest) at test/ex_burn/server/server_test.exs:120: " <>
               "Assertion failed, no matching message after 100ms | code: assert_receive {:done, _}",
             "test another (ExBurn.OtherTest) at test/other_test.exs:7: ** (ExBurn.Error) load_model: not found"
           ]

    rust = """
    failures:

    ---- kernels::cpu::linear::tests::rows_agree stdout ----

    thread 'kernels::cpu::linear::tests::rows_agree' panicked at src/kernels/cpu/linear.rs:301:9:
    assertion `left == right` failed
      left: 1

    failures:
        kernels::cpu::linear::tests::rows_agree
    """

    assert All.failures(:rust, rust) == [
             "kernels::cpu::linear::tests::rows_agree: assertion `left == right` failed (src/kernels/cpu/linear.rs:301:9:)"
           ]

    assert All.failures(:exunit, "3 tests, 0 failures\n") == []
    assert All.failures(:nx_suite, exunit) == []

    suite =
      exunit <>
        """

        Nx's own tests through ExBurn (backend): 3 run, 1 pass, 2 fail
          1 literal_on_backend: Nx.Defn.Expr inlines tensors
          1 unexplained: not explained: a fault to look at
              ExBurn.ServerTest: test a served request streams
        """

    assert All.failures(:nx_suite, suite) == [
             "test a served request streams (ExBurn.ServerTest) at test/ex_burn/server/server_test.exs:120: " <>
               "Assertion failed, no matching message after 100ms | code: assert_receive {:done, _}"
           ]
  end
end
