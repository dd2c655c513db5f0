// Testbench wrapper (not generated): one direction of a board-to-board transport,
// net_pack -> net_tx -> net_channel -> net_rx -> net_unpack, with the acknowledgements
// going back through the channel's reverse lane; for test_transport.py.
`default_nettype none
module net_chain #(
    parameter integer DATA_W = 64,
    parameter integer BEAT_W = 512,
    parameter integer SEQ_W = 16,
    parameter integer CNT_W = 8,
    parameter integer DEST_W = 16,
    parameter integer WORDS = 7,
    parameter integer SAMPLE_WORDS = 100,
    parameter integer SAMPLE_W = 7,
    parameter integer ADDR_W = 6,
    parameter integer CREDITS = 64,
    parameter integer FRAME_BEATS = 16,
    parameter integer FRAME_W = 4,
    parameter integer TIMEOUT = 200,
    parameter integer TIMER_W = 8,
    parameter integer DEST = 0,
    parameter integer ACK_PERIOD = 8,
    parameter integer ACK_W = 3,
    parameter integer BEAT_BYTES = 64,
    parameter integer BW_NUM = 64,
    parameter integer BW_DEN = 1,
    parameter integer TOKEN_W = 8,
    parameter integer LATENCY = 16,
    parameter integer PTR_W = 4,
    parameter integer HOLD_W = 5,
    parameter integer HOLD_MAX = 64,
    parameter integer P_LOSS = 0,
    parameter integer P_REORDER = 0,
    parameter integer P_ACK_LOSS = 0,
    parameter integer SEED = 1
) (
    input  wire              clk,
    input  wire              rst,
    input  wire [DATA_W-1:0] s_axis_tdata,
    input  wire              s_axis_tvalid,
    output wire              s_axis_tready,
    output wire [DATA_W-1:0] m_axis_tdata,
    output wire              m_axis_tvalid,
    input  wire              m_axis_tready,
    output wire              line_tvalid,
    output wire              line_tlast,
    output wire [31:0]       lost,
    output wire [31:0]       held,
    output wire [31:0]       rewinds,
    output wire [31:0]       dropped,
    output wire              overflow
);
    wire [BEAT_W-1:0] pk_tdata;
    wire pk_tvalid, pk_tready;
    wire [BEAT_W-1:0] tx_tdata;
    wire [BEAT_W/8-1:0] tx_tkeep;
    wire [DEST_W-1:0] tx_tdest;
    wire tx_tlast, tx_tvalid, tx_tready;
    wire [BEAT_W-1:0] ch_tdata;
    wire [BEAT_W/8-1:0] ch_tkeep;
    wire [DEST_W-1:0] ch_tdest;
    wire ch_tlast, ch_tvalid, ch_tready;
    wire [BEAT_W-1:0] rx_tdata;
    wire rx_tvalid, rx_tready;
    wire [2*SEQ_W-1:0] ack_in, ack_out;
    wire ack_in_valid, ack_out_valid;
    wire ch_overflow, rx_overflow;

    assign line_tvalid = tx_tvalid && tx_tready;
    assign line_tlast = tx_tlast;
    assign overflow = ch_overflow | rx_overflow;

    net_pack #(.DATA_W(DATA_W), .BEAT_W(BEAT_W), .SEQ_W(SEQ_W), .CNT_W(CNT_W), .WORDS(WORDS),
               .SAMPLE_WORDS(SAMPLE_WORDS), .SAMPLE_W(SAMPLE_W)) u_pack (
        .clk(clk), .rst(rst),
        .s_axis_tdata(s_axis_tdata), .s_axis_tvalid(s_axis_tvalid), .s_axis_tready(s_axis_tready),
        .m_axis_tdata(pk_tdata), .m_axis_tvalid(pk_tvalid), .m_axis_tready(pk_tready));

    net_tx #(.BEAT_W(BEAT_W), .SEQ_W(SEQ_W), .ADDR_W(ADDR_W), .CREDITS(CREDITS), .FRAME_BEATS(FRAME_BEATS),
             .FRAME_W(FRAME_W), .TIMEOUT(TIMEOUT), .TIMER_W(TIMER_W), .DEST_W(DEST_W), .DEST(DEST)) u_tx (
        .clk(clk), .rst(rst),
        .s_axis_tdata(pk_tdata), .s_axis_tvalid(pk_tvalid), .s_axis_tready(pk_tready),
        .m_axis_tdata(tx_tdata), .m_axis_tkeep(tx_tkeep), .m_axis_tdest(tx_tdest), .m_axis_tlast(tx_tlast),
        .m_axis_tvalid(tx_tvalid), .m_axis_tready(tx_tready),
        .s_axis_ack_tdata(ack_out), .s_axis_ack_tvalid(ack_out_valid), .rewinds(rewinds));

    net_channel #(.BEAT_W(BEAT_W), .DEST_W(DEST_W), .ACK_W(2*SEQ_W), .BEAT_BYTES(BEAT_BYTES), .BW_NUM(BW_NUM),
                  .BW_DEN(BW_DEN), .TOKEN_W(TOKEN_W), .LATENCY(LATENCY), .PTR_W(PTR_W),
                  .HOLD_W(HOLD_W), .HOLD_MAX(HOLD_MAX), .P_LOSS(P_LOSS),
                  .P_REORDER(P_REORDER), .P_ACK_LOSS(P_ACK_LOSS), .SEED(SEED)) u_chan (
        .clk(clk), .rst(rst),
        .s_axis_tdata(tx_tdata), .s_axis_tkeep(tx_tkeep), .s_axis_tdest(tx_tdest), .s_axis_tlast(tx_tlast),
        .s_axis_tvalid(tx_tvalid), .s_axis_tready(tx_tready),
        .m_axis_tdata(ch_tdata), .m_axis_tkeep(ch_tkeep), .m_axis_tdest(ch_tdest), .m_axis_tlast(ch_tlast),
        .m_axis_tvalid(ch_tvalid), .m_axis_tready(ch_tready),
        .s_axis_ack_tdata(ack_in), .s_axis_ack_tvalid(ack_in_valid),
        .m_axis_ack_tdata(ack_out), .m_axis_ack_tvalid(ack_out_valid),
        .lost(lost), .held(held), .overflow(ch_overflow));

    net_rx #(.BEAT_W(BEAT_W), .SEQ_W(SEQ_W), .DEPTH(CREDITS), .ADDR_W(ADDR_W), .ACK_PERIOD(ACK_PERIOD),
             .ACK_W(ACK_W), .DEST_W(DEST_W)) u_rx (
        .clk(clk), .rst(rst),
        .s_axis_tdata(ch_tdata), .s_axis_tkeep(ch_tkeep), .s_axis_tdest(ch_tdest), .s_axis_tlast(ch_tlast),
        .s_axis_tvalid(ch_tvalid), .s_axis_tready(ch_tready),
        .m_axis_tdata(rx_tdata), .m_axis_tvalid(rx_tvalid), .m_axis_tready(rx_tready),
        .m_axis_ack_tdata(ack_in), .m_axis_ack_tvalid(ack_in_valid), .dropped(dropped), .overflow(rx_overflow));

    net_unpack #(.DATA_W(DATA_W), .BEAT_W(BEAT_W), .SEQ_W(SEQ_W), .CNT_W(CNT_W)) u_unpack (
        .clk(clk), .rst(rst),
        .s_axis_tdata(rx_tdata), .s_axis_tvalid(rx_tvalid), .s_axis_tready(rx_tready),
        .m_axis_tdata(m_axis_tdata), .m_axis_tvalid(m_axis_tvalid), .m_axis_tready(m_axis_tready));
endmodule
`default_nettype wire
