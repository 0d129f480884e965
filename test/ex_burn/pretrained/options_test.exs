defmodule ExBurn.Pretrained.OptionsTest do
  # Load, embed and generation options: checked in Elixir, where every default is filled in, and
  # typed at the NIF, which takes every field and no other. None of this needs a model file.
  use ExUnit.Case, async: true

  import Bitwise
  alias ExBurn.{Embedding, LLM, Native}

  @documented %{
    max_tokens: 256,
    temperature: 0.8,
    top_k: 40,
    top_p: 0.95,
    stop: [],
    stop_token_ids: [],
    ignore_eos: false
  }

  defp opts!(opts) do
    {:ok, %{opts: opts}} = LLM.start_args("hi", opts)
    opts
  end

  defp invalid(opts) do
    assert {:error, %ExBurn.Error{op: :llm_start, details: %{kind: :invalid_option} = details} = e} =
             LLM.start_args("hi", opts)

    {e.reason, details}
  end

  describe "generation options" do
    test "without options: the documented defaults and a random seed" do
      opts = opts!([])
      assert Map.delete(opts, :seed) == @documented
      assert is_integer(opts.seed) and opts.seed > 0
    end

    test "given values replace the defaults; greedy is temperature 0; nil turns top_k/top_p off" do
      assert opts!(temperature: 1, top_k: 5, seed: 3, stop: "\n") ==
               %{@documented | temperature: 1.0, top_k: 5, stop: ["\n"]} |> Map.put(:seed, 3)

      assert opts!(greedy: true, temperature: 1.5).temperature == 0.0
      assert opts!(ignore_eos: true).ignore_eos == true
      # a signed 64-bit seed is taken as its two's complement, as the server passes them
      assert opts!(seed: -1).seed == (1 <<< 64) - 1
      assert %{top_k: nil, top_p: nil} = opts!(top_k: nil, top_p: nil)
      # any other nil takes the default
      assert %{temperature: 0.8, max_tokens: 256, stop: []} =
               opts!(temperature: nil, max_tokens: nil, stop: nil)
    end

    test "an unknown option is named in the reason and the details" do
      assert {"unknown option :max_token", details} = invalid(max_token: 3, temprature: 1)
      assert %{option: :max_token, unknown: [:max_token, :temprature]} = details
      assert {"options must be a keyword list", _} = invalid(%{max_tokens: 3})
    end

    test "a value of the wrong kind is named" do
      for {key, bad} <- [
            max_tokens: -1,
            max_tokens: 2.0,
            greedy: 1,
            temperature: "hot",
            temperature: -0.5,
            top_k: 1.5,
            top_p: 1.5,
            seed: -(1 <<< 63) - 1,
            seed: 1 <<< 64,
            stop: [1],
            stop_token_ids: [-1],
            stop_token_ids: 7,
            ignore_eos: "yes"
          ] do
        assert {reason, %{option: ^key, value: ^bad}} = invalid([{key, bad}])
        assert reason =~ "invalid value for option #{inspect(key)}"
      end
    end
  end

  describe "load, embed and tokenize options" do
    test "an unknown load option is an error before the model is looked up" do
      for load <- [&LLM.load/2, &Embedding.load/2] do
        assert {:error, %ExBurn.Error{op: :load, reason: "unknown option :engin", details: details}} =
                 load.("no-such-model", engin: :burn)

        assert %{option: :engin, kind: :invalid_option, allowed: [:engine, :device, :dir]} = details
      end
    end

    test "embed/3 and tokenize/3 reject unknown options before touching the model" do
      assert {:error, %ExBurn.Error{op: :embed, details: %{option: :ass, kind: :invalid_option}}} =
               Embedding.embed(%Embedding{}, ["text"], ass: :list)

      assert {:error, %ExBurn.Error{op: :embed, details: %{as: :xml, kind: :invalid_option}}} =
               Embedding.embed(%Embedding{}, "text", as: :xml)

      assert {:error, %ExBurn.Error{op: :tokenize, details: %{option: :add_specials}}} =
               LLM.tokenize(%LLM{}, "text", add_specials: true)
    end
  end

  describe "the NIFs take typed maps, all keys and no others" do
    test "generation options: the full map decodes; an extra or a missing key does not" do
      opts = opts!(seed: 1)
      prompt = {:text, "hi"}

      # the options decode, then the (fake) model is refused
      assert {:error, {:llm_start, _, %{argument: "llm"}}} = Native.llm_start(make_ref(), prompt, opts)

      assert {:error, {:llm_start, "unknown key :temprature in opts", %{key: "temprature"}}} =
               Native.llm_start(make_ref(), prompt, Map.put(opts, :temprature, 1.0))

      for key <- Map.keys(opts) do
        assert {:error, {:llm_start, _, %{argument: "opts"}}} =
                 Native.llm_start(make_ref(), prompt, Map.delete(opts, key))
      end
    end

    test "prompts and options that are junk get error tuples" do
      opts = opts!(seed: 1)

      for junk <- [:junk, "hi", %{}, [], {:text}, {:text, 1}, {:chat, [{"user"}]}, {:chat, "x"}, {:poem, "x"}] do
        assert {:error, {:llm_start, reason, %{argument: "prompt"}}} =
                 Native.llm_start(make_ref(), junk, opts)

        assert is_binary(reason)
      end

      for junk <- [
            :junk,
            [max_tokens: 1],
            %{max_tokens: 1},
            %{opts | temperature: "hot"},
            %{opts | stop: "x"}
          ] do
        assert {:error, {:llm_start, _, %{argument: "opts"}}} =
                 Native.llm_start(make_ref(), {:text, "hi"}, junk)
      end
    end

    test "load options: a concrete engine and a device, nothing else" do
      for load <- [&Native.llm_load/2, &Native.embedder_load/2] do
        for bad <- [
              %{engine: :auto, device: {:cpu, 0}},
              %{engine: :burn},
              %{engine: :burn, device: {:tpu, 0}},
              %{engine: :burn, device: {:cpu, 0}, dir: "/tmp"},
              [engine: :burn, device: {:cpu, 0}],
              :burn
            ] do
          assert {:error, {_op, reason, %{argument: "opts"}}} = load.("/nonexistent/model", bad), inspect(bad)
          assert is_binary(reason)
        end

        # well-formed options reach the loader, which reports the missing file
        assert {:error, {_, _, %{kind: :missing_file}}} =
                 load.("/nonexistent/model", %{engine: :candle, device: {:cpu, 0}})
      end
    end
  end
end
